"""Wall time of the command line's quick answers: ``segood --help``, ``segood --version`` and each subcommand's
``--help``, each the best of ``--repeat`` runs of a fresh ``python -m segood`` process, back to back.

    python benchmarks/bench_cli_startup.py [--repeat 5] [--python PYTHON]

Prints a markdown table (command, best and median seconds) and the slowest command; the target is under 0.5 s.
"""

import argparse
import statistics
import subprocess
import sys
import time

SUBCOMMANDS = ("demo", "metrics", "convert", "train", "miou", "evaluate", "attack", "attack-generator", "protocol",
               "robustness", "approve", "export", "report", "score", "submit", "benchmark", "leaderboard")


def wall_times(python, argv, repeat):
    """Seconds of ``repeat`` runs of ``python -m segood *argv`` (each must exit 0)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([python, "-m", "segood", *argv], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    commands = [["--help"], ["--version"], *([name, "--help"] for name in SUBCOMMANDS)]
    rows = [(" ".join(argv), wall_times(args.python, argv, args.repeat)) for argv in commands]
    print(f"| command | best of {args.repeat} (s) | median (s) |\n|---|---:|---:|")
    for command, times in rows:
        print(f"| `segood {command}` | {min(times):.3f} | {statistics.median(times):.3f} |")
    command, times = max(rows, key=lambda row: min(row[1]))
    print(f"\nslowest: segood {command}, {min(times):.3f} s (target < 0.5 s)")


if __name__ == "__main__":
    main()
