"""The lab: scripts the developers run on the GPU machines (bench/*.sh, bench/*.py) and the
lab's measuring tools (bench/lab/), outside the installed package. Run from the repository
root with PYTHONPATH=. (e.g. `python -m bench.lab.soak`); `trident bench SUITE` holds the
user-facing suites."""
