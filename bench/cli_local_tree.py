"""One source tree's batch CLI local mode (bench/cli_local.py's no-op engine: all but the
model): start-up and work as wall seconds and as this process's CPU seconds (all its threads).
    python bench/cli_local_tree.py TREE SRC_DIR OUT_DIR   (bench/cli_local_ab.sh runs it on two revisions)"""
import sys
import time
from pathlib import Path

tree, src, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
sys.path.insert(0, str(tree))
from bench import cli_local as m  # noqa: E402
from pipeline import cli  # noqa: E402
from pipeline.config import Settings  # noqa: E402
from pipeline.domain.types import TranscribeOptions  # noqa: E402
from pipeline.model.demo import ensure_model_dir  # noqa: E402

assert cli.__file__.startswith(str(tree)), cli.__file__
m.no_op_engine()
settings = Settings(model=str(ensure_model_dir("demo")), device="cpu", data_dir=out / "data")
formats = ("txt", "srt")
w0, c0 = time.perf_counter(), time.process_time()
plan = cli.make_plan([str(src)], out, formats)
with cli.LocalBackend(settings, TranscribeOptions(language="en"), formats) as backend:
    w1, c1 = time.perf_counter(), time.process_time()
    tally = cli.LocalRunner(backend, formats, cli.LOCAL_JOBS, progress=False, output_dir=out).run(plan.todo, cli.Tally())
    w2, c2 = time.perf_counter(), time.process_time()
assert not tally.failures and tally.transcribed == len(plan.todo)
print(f"files {tally.transcribed} start wall {w1 - w0:.2f} cpu {c1 - c0:.2f} | work wall {w2 - w1:.2f} "
      f"cpu {c2 - c1:.2f} | files/s wall {tally.transcribed / (w2 - w1):.0f} files per cpu-s {tally.transcribed / (c2 - c1):.0f}")
