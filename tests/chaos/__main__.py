"""``python -m tests.chaos --trials N --seed S [--quick] [--report DIR]``: run a seeded fault
campaign, one trial at a time, and write its report; ``--replay SEED:INDEX[:quick]`` runs one
trial again. Exits 1 if any trial failed."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from tests.chaos import report, runner, schedule


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="index of the first trial")
    parser.add_argument("--quick", action="store_true",
                        help=f"the quick subset: seed {schedule.QUICK_SEED}, one trial per "
                             "recovery mode")
    parser.add_argument("--replay", metavar="SEED:INDEX[:quick]", help="run this trial alone")
    parser.add_argument("--report", type=Path, help="default: reports/chaos-<timestamp>/")
    parser.add_argument("--keep", action="store_true", help="keep every trial's directory")
    args = parser.parse_args(argv)
    if args.replay:
        try:
            seed, first, quick = schedule.parse_replay(args.replay)
        except ValueError as exc:
            parser.error(str(exc))
        count = 1
    elif args.quick:
        seed, first, quick, count = schedule.QUICK_SEED, 0, True, len(schedule.QUICK)
    else:
        seed, first, quick, count = args.seed, args.first, False, args.trials
    directory = args.report or runner.ROOT / "reports" / time.strftime("chaos-%Y%m%d-%H%M%S")
    cache = runner.ROOT / "reports" / "chaos-references"
    records: list[dict] = []
    start = time.monotonic()
    for index in range(first, first + count):
        trial = schedule.draw(seed, index, quick)
        out = Path(tempfile.mkdtemp(prefix=f"hpcrep-chaos-{seed}-{index}-"))
        print(f"trial {trial.name}: {trial.mode}/{trial.features}/{trial.kind} "
              f"{[(f.kind, f.when, f.units, f.victim) for f in trial.faults]}", flush=True)
        began = time.monotonic()
        record = runner.run_trial(trial, out, cache)
        record["seconds"] = round(time.monotonic() - began, 1)
        record["dir"] = str(out)
        records.append(record)
        (directory / "trials").mkdir(parents=True, exist_ok=True)
        runner.write_record(record, directory / "trials" / f"{seed}-{index}.json")
        print(f"  -> {record['outcome']} in {record['seconds']} s "
              f"{record.get('problems') or ''}", flush=True)
        if report.failed(record) or args.keep:
            print(f"  kept {out}; replay: {trial.replay_command()}", flush=True)
        else:
            shutil.rmtree(out, ignore_errors=True)
        report.write(directory, records, seed, time.monotonic() - start)
    path = report.write(directory, records, seed, time.monotonic() - start)
    print(path.read_text())
    return 1 if any(report.failed(r) for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
