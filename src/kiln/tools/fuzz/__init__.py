"""kiln's random-program fuzzer: `python -m kiln.tools.fuzz --seed S --n N`.

grammar.py + families.py generate a program from (seed, index); program.py renders it as
plain PyTorch source; runner.py runs it in eager, in float64 and compiled, and compare.py
judges the difference; shrink.py reduces a failure; pool.py runs programs in worker processes.
"""
