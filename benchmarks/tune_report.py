"""Summarise the autotuning records under a kiln cache: per kernel, the heuristic's time
against the best candidate's (what the default launch configuration leaves on the table).

    python -m benchmarks.tune_report KILN_CACHE_DIR
"""

import json
import sys
from pathlib import Path


def main() -> int:
    rows = []
    for record in Path(sys.argv[1]).glob("triton/*.tune.json"):
        data = json.loads(record.read_text())
        times = data["ms"]
        first = next(iter(times))  # candidates are listed heuristic first
        best = min(times, key=times.get)
        rows.append((times[first] - times[best], record.stem.split(".")[0], first, best, times[first], times[best]))
    rows.sort(reverse=True)
    print(f"{len(rows)} kernels; heuristic loses {sum(r[0] for r in rows):.3f} ms in total")
    for lost, name, first, best, t_first, t_best in rows[:15]:
        print(f"{name}: heuristic {first} {t_first:.4f} ms, best {best} {t_best:.4f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
