"""Run the three throughput benchmarks, each right after its peer when the
peers' virtual environment exists (../shared/peers/setup.sh makes it).

Usage: python bench/run_all.py [--no-peers]
Prints one JSON line per run.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "..", "..", "shared", "peers")
PEER_PYTHON = "/tmp/peers-venv/bin/python"

WORK = [
    # (ours, peer)
    (["gymnax:Pendulum-v1", "mlp", "256", "32", "3000000", "0.1"],
     ["original_nnxppo.py", "Pendulum-v1", "mlp", "256", "32", "3000000", "0.1"]),
    (["gymnax:Pendulum-v1", "lstm", "256", "32", "1000000", "0.1"],
     ["original_nnxppo.py", "Pendulum-v1", "lstm", "256", "32", "1000000", "0.1"]),
    (["playground:CartpoleBalance", "mlp", "256", "30", "1000000"],
     ["original_playground.py", "CartpoleBalance", "256", "30", "1000000"]),
]


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    print(lines[-1] if lines else f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}", flush=True)


def main():
    with_peers = "--no-peers" not in sys.argv and os.path.exists(PEER_PYTHON)
    for ours, peer in WORK:
        run([sys.executable, os.path.join(HERE, "bench_ppo.py"), *ours])
        if with_peers:
            run([PEER_PYTHON, os.path.join(PEERS, peer[0]), *peer[1:]])


if __name__ == "__main__":
    main()
