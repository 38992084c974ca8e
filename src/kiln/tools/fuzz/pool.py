"""Run fuzz jobs: in this process, or in worker processes so that a compiler that hangs or
kills its process is a recorded failure rather than the end of the run."""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from kiln.tools.fuzz.grammar import generate
from kiln.tools.fuzz.program import render, reproducer
from kiln.tools.fuzz.runner import Outcome, run_program, short
from kiln.tools.fuzz.shrink import shrink

COMPILE_LINE = {
    "kiln": "kiln.compile(f)",
    "inductor": "torch.compile(f)",
    "eager": "torch.compile(f, backend='eager')",
    "aot_eager": "torch.compile(f, backend='aot_eager')",
}


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout()


def run_timed(program, against: str, timeout: int) -> Outcome:
    """run_program, a crash when it takes more than timeout seconds (SIGALRM, main thread)."""
    use_alarm = threading.current_thread() is threading.main_thread() and timeout > 0
    if use_alarm:
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(timeout)
    try:
        return run_program(program, against)
    except _Timeout:
        return Outcome("crash", f"timed out after {timeout} s")
    finally:
        if use_alarm:
            signal.alarm(0)


def run_job(job: dict) -> dict:
    """One program of a run: generate, run, and shrink it if it fails."""
    seed, index, against = job["seed"], job["index"], job["against"]
    try:
        program = generate(seed, index, job["profile"], frozenset(job["excluded"]))
    except RuntimeError as e:
        return {"seed": seed, "index": index, "cls": "eager fails", "detail": str(e)[:300]}
    outcome = run_timed(program, against, job["timeout"])
    result = {
        "seed": seed,
        "index": index,
        "grad": program.grad,
        "stmts": len(program.stmts),
        **outcome.to_dict(),
    }
    if outcome.failed:
        result["source"] = reproducer(program, COMPILE_LINE[against])
        if job["shrink_seconds"] > 0:
            def same(p):
                return run_timed(p, against, job["timeout"]).cls == outcome.cls

            small = shrink(program, same, job["shrink_seconds"])
            result["shrunk"] = reproducer(small, COMPILE_LINE[against])
            result["shrunk_detail"] = run_timed(small, against, job["timeout"]).detail
    return result


def serve() -> int:
    """Worker side: one JSON job per stdin line; a 'start' line, then the result line."""
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps({"start": job["index"]}), flush=True)
        try:
            result = run_job(job)
        except Exception as e:  # noqa: BLE001 - the fuzzer's own error: report it, keep serving
            result = {"seed": job["seed"], "index": job["index"], "cls": "fuzzer error", "detail": short(e)}
        print(json.dumps(result), flush=True)
    return 0


def run_jobs(
    jobs: list[dict], workers: int, on_result: Callable[[dict], None], env: dict | None = None
) -> None:
    """Run jobs in this process (workers 0) or in that many worker processes."""
    if workers <= 0:
        for job in jobs:
            on_result(run_job(job))
        return
    todo: queue.Queue = queue.Queue()
    for job in jobs:
        todo.put(job)
    lock = threading.Lock()

    def locked(result: dict) -> None:
        with lock:
            on_result(result)

    threads = [threading.Thread(target=_Worker(todo, locked, env).loop) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class _Worker:
    def __init__(self, todo: queue.Queue, on_result: Callable[[dict], None], env: dict | None):
        self.todo, self.on_result, self.env = todo, on_result, env
        self.proc: subprocess.Popen | None = None
        self.buffer = b""

    def _start(self) -> None:
        env = {**os.environ, **(self.env or {})}
        cmd = [sys.executable, "-m", "kiln.tools.fuzz", "--serve"]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self.buffer = b""

    def _readline(self, deadline: float) -> str | None:
        """The next line, or None when the worker died or the deadline passed."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.time()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def loop(self) -> None:
        while True:
            try:
                job = self.todo.get_nowait()
            except queue.Empty:
                break
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
            # a job may shrink after it runs: allow for both, and for the worker's start-up
            deadline = time.time() + 60 + 2 * job["timeout"] + job["shrink_seconds"] * 1.5
            line = self._readline(deadline)
            if line is not None:
                line = self._readline(deadline)
            if line is None:
                self.on_result(self._died(job))
            else:
                self.on_result(json.loads(line))
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()

    def _died(self, job: dict) -> dict:
        self.proc.kill()
        rc = self.proc.wait()
        self.proc = None
        program = generate(job["seed"], job["index"], job["profile"], frozenset(job["excluded"]))
        why = "timed out (worker killed)" if rc == -signal.SIGKILL else f"worker died with exit status {rc}"
        return {
            "seed": job["seed"],
            "index": job["index"],
            "cls": "crash",
            "detail": why,
            "source": render(program),
            "grad": program.grad,
            "stmts": len(program.stmts),
        }
