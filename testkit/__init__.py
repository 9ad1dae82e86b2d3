"""What the tests and the benchmarks share: the runners and the binary as processes
(runners.py), interleaved runs for the compare gate (compare_runs.py) and a farm of real
sshd servers on loopback standing in for boards (sshd.py). Nothing here is a mock."""
