"""The screen at the start of a job, before the long run: every node of the allocation (spares too)
runs a short matrix product on each of its devices, then sends to the next node of a ring while
it receives from the one before; a node far below both what its devices should give (the
profile's peak, where it has one) and what the job's other nodes give, or both of whose links
are far below the ring's other links, is left out before the trainer starts. With a spare to take its place, the launch goes on without it
(failover reads SCREEN_FILE); without, the job stops here (EXIT_SCREENED_OUT) with the figures.

    python -m mmm_orch.injob.screen --dir JOB_DIR --active N --seconds S --of-median M \\
        [--peak-gflops G --of-peak F] --on-fail stop|warn --device cpu|cuda|xpu --devices D \\
        --per-node 'srun --nodes=3 --ntasks=3 --ntasks-per-node=1'

The --per-node words run a command once on every node (the profile's launcher.per_node): here,
`python -m mmm_orch.injob.screen measure`, whose task of rank R writes SCREEN_DIR/R.json. Rank R
ran on the R-th node of NODES_FILE (the launcher's block order). A node with no figures within
the time bound is left out too: it did not answer. The verdict, per node with units, goes to
the log (SCREEN lines) and to SCREEN_FILE, which mmm-orch reads into the job's record and its
bad-node memory.

The ring runs over TCP between the nodes' high-speed-network addresses (the profile's
rendezvous.host_addr): each task listens on a port of its own, which it writes beside its
figures (SCREEN_DIR/R.port), so that no two jobs on a node share a port. It measures each link
as its receiver sees it (GB/s, the best of its windows, as the matrix products'): a degraded NIC or link shows in
both of its node's links, and in no other. It is not the collective's own figure (NCCL, oneCCL);
that needs the device.

The kernel on a CPU is a matrix product in Python itself (no torch to import: the screen stays
a second or two), on a GPU torch's bf16 matrix product. Each device's figure is its best window
of several: a window that a busy host starved does not make a node look slow; a node that is
slow is slow in every window. Standard library only, and mmm_orch's protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from mmm_orch.injob import files, protocol

WINDOWS = 4  # per device: the figure is the best of them
WINDOW_S = 0.2  # each; at least one CPU quota period (100 ms), so a throttled node shows it
CPU_SIZE = 40  # the Python matrix product's side: 2 * 40^3 flops, about 5 ms a product
GPU_SIZE = 4096  # torch's bf16 matrix product's side, as a trainer's layers are
# The variables a per-node launcher gives each task its rank in (Slurm, Hydra and PMI, PALS,
# Open MPI, PMIx).
RANK_VARS = ("SLURM_PROCID", "PMI_RANK", "PALS_RANKID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
LINK_CHUNK = 1 << 20  # the ring's sends and receives, in bytes
LINK_SECONDS = 10.0  # at most, for the ring (less where the screen's bound is shorter)


# -- on each node -------------------------------------------------------------------------------


def python_matmul_gflops(seconds: float) -> float:
    """GFLOP/s of a matrix product in Python over `seconds`."""
    n = CPU_SIZE
    a = [[float((i * j) % 7) for j in range(n)] for i in range(n)]
    columns = list(zip(*a, strict=True))
    products, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        [[sum(x * y for x, y in zip(row, col, strict=True)) for col in columns] for row in a]
        products += 1
    return 2 * n**3 * products / max(elapsed, 1e-9) / 1e9


def torch_matmul_gflops(device: str, index: int, seconds: float) -> float:  # pragma: no cover
    """GFLOP/s of torch's bf16 matrix product on device `index` over `seconds` (a GPU)."""
    import torch

    where = torch.device(device, index)
    module = getattr(torch, device)
    a = torch.randn(GPU_SIZE, GPU_SIZE, device=where, dtype=torch.bfloat16)
    (a @ a).sum().item()  # warm: the kernel chosen, the clocks up
    products, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a @ a
        products += 1
        if products % 8 == 0:
            module.synchronize(where)
    module.synchronize(where)
    elapsed = time.perf_counter() - start
    return 2 * GPU_SIZE**3 * products / elapsed / 1e9


def measure(out: Path, device: str, devices: int, host_addr: str, link_seconds: float) -> None:
    """This node's figures: each device's best window, and the ring's link from the node before
    it (GB/s), to OUT/RANK.json."""
    rank = next((int(os.environ[v]) for v in RANK_VARS if os.environ.get(v, "").isdigit()), 0)
    figures = []
    for index in range(max(devices, 1)):
        windows = [
            python_matmul_gflops(WINDOW_S)
            if device == "cpu"
            else torch_matmul_gflops(device, index, WINDOW_S)
            for _ in range(WINDOWS)
        ]
        figures.append(max(windows))
    nodes = [n for n in (out.parent / protocol.NODES_FILE).read_text().split() if n]
    link = ring_link(out, rank, nodes, host_addr, link_seconds) if len(nodes) > 1 else None
    protocol.write_atomically(
        out / f"{rank}.json",
        json.dumps({"rank": rank, "host": socket.gethostname(), "gflops": figures, "link": link}),
    )


def ring_link(
    out: Path, rank: int, nodes: list[str], host_addr: str, seconds: float
) -> float | None:
    """GB/s from the ring's node before this one (rank - 1), while this one sends to the next:
    the best of WINDOWS windows of WINDOW_S, as received; None where the node before never
    sent within `seconds`."""
    deadline = time.monotonic() + seconds
    node = nodes[rank]
    address = (host_addr or "{node}").format(node=node, short=node.split(".", 1)[0])
    with socket.create_server(("", 0)) as server:
        port = server.getsockname()[1]
        protocol.write_atomically(out / f"{rank}.port", json.dumps([address, port]))
        after = out / f"{(rank + 1) % len(nodes)}.port"
        sender = threading.Thread(target=_send_ring, args=(after, deadline), daemon=True)
        sender.start()
        server.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            before, _ = server.accept()
        except OSError:  # (the timeout): the node before never sent
            return None
        with before:  # closing it tells the node before to stop
            best = max(_received(before, deadline) for _ in range(WINDOWS))
        sender.join(max(0.0, deadline - time.monotonic()))
    return round(best / 1e9, 3) if best else None


def _send_ring(after: Path, deadline: float) -> None:
    """Send to the next node, once its port is written, until it has measured (it closes)."""
    while not after.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    try:
        host, port = json.loads(after.read_text())
        chunk = memoryview(bytearray(LINK_CHUNK))
        left = max(0.1, deadline - time.monotonic())
        with socket.create_connection((host, port), timeout=left) as link:
            while time.monotonic() < deadline:
                link.sendall(chunk)
    except (OSError, ValueError):
        return  # closed by the next node once it measured, or it never answered


def _received(link: socket.socket, deadline: float) -> float:
    """Bytes per second received over one window of WINDOW_S (0 once the deadline passed)."""
    buffer = memoryview(bytearray(LINK_CHUNK))
    start = time.perf_counter()
    got = 0
    try:
        link.settimeout(max(0.1, deadline - time.monotonic()))
        while (elapsed := time.perf_counter() - start) < WINDOW_S:
            if time.monotonic() > deadline or not (n := link.recv_into(buffer)):
                break
            got += n
    except OSError:
        return 0.0
    return got / elapsed if elapsed > 0 else 0.0


# -- the verdict, on the first node -------------------------------------------------------------


def judge(
    nodes: list[str],
    figures: dict[str, list[float]],
    of_median: float,
    peak: float | None,
    of_peak: float,
    links: dict[str, float] | None = None,
) -> list[files.ScreenedNode]:
    """Each node, left out where its slowest device is below `of_median` of the other nodes'
    median and (where the profile gives one) below `of_peak` of the peak: far below both; or
    where both of its ring links (`links`: each node's from the node before it, GB/s) are below
    `of_median` of the median of the ring's other links. A node with no figures did not answer
    in time."""
    slowest = {node: min(figures[node]) for node in nodes if figures.get(node)}
    links = links or {}
    judged = []
    for at, node in enumerate(nodes):
        if node not in slowest:
            why = "no figures within the screen's time bound"
            judged.append(files.ScreenedNode(node, (), left_out=True, why=why))
            continue
        others = [slowest[n] for n in nodes if n != node and n in slowest]
        median = statistics.median(others) if others else None
        ratio = slowest[node] / median if median else None
        to_peak = slowest[node] / peak if peak else None
        below = (ratio is not None and ratio < of_median) and (to_peak is None or to_peak < of_peak)
        reasons = []
        if below:
            reasons.append(
                f"matmul {slowest[node]:.3g} GFLOP/s, {ratio:.0%} of the other nodes' median "
                f"({median:.3g})" + (f", {to_peak:.1%} of the peak" if to_peak is not None else "")
            )
        after = nodes[(at + 1) % len(nodes)]
        link_in, link_out = links.get(node), links.get(after)
        rest = [links[n] for n in nodes if n not in (node, after) and n in links]
        link_ratio = None
        if link_in is not None and link_out is not None and rest:
            rest_median = statistics.median(rest)
            link_ratio = min(link_in, link_out) / rest_median if rest_median else None
            if rest_median and max(link_in, link_out) / rest_median < of_median:
                reasons.append(
                    f"ring links {link_in:.3g} GB/s in, {link_out:.3g} out, "
                    f"{max(link_in, link_out) / rest_median:.0%} of the other links' median "
                    f"({rest_median:.3g})"
                )
        judged.append(
            files.ScreenedNode(
                node,
                tuple(figures[node]),
                ratio,
                to_peak,
                bool(reasons),
                "; ".join(reasons),
                link_in,
                link_out,
                link_ratio,
            )
        )
    return judged


def line(node: files.ScreenedNode) -> str:
    """A node's SCREEN line: its figures with units, and its verdict."""
    if not node.gflops:
        return f" {node.node}: {node.why}: left out"
    each = ", ".join(f"{v:.3g}" for v in node.gflops)
    compared = "" if node.of_median is None else f"; {node.of_median:.0%} of the other nodes"
    if node.of_peak is not None:
        compared += f", {node.of_peak:.1%} of the peak"
    if node.link_in is not None and node.link_out is not None:
        compared += f"; ring link GB/s in {node.link_in:.3g}, out {node.link_out:.3g}"
        if node.link_of_median is not None:
            compared += f", {node.link_of_median:.0%} of the other links"
    return f" {node.node} matmul GFLOP/s per device: {each}{compared}: " + (
        "left out" if node.left_out else "ok"
    )


def figures(out: Path, nodes: list[str]) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each node's figures, from its task's file (rank R: the R-th node): its devices' and its
    ring link's from the node before it (where it measured one)."""
    found: dict[str, list[float]] = {}
    links: dict[str, float] = {}
    for path in out.glob("*.json"):
        try:
            data = json.loads(path.read_text())
            node = nodes[int(data["rank"])]
            found[node] = [float(v) for v in data["gflops"]]
            if data.get("link") is not None:
                links[node] = float(data["link"])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue  # a torn or foreign file: that node gave no figures
    return found, links


def run(args: argparse.Namespace) -> int:
    start = time.time()
    nodes = [n for n in (args.dir / protocol.NODES_FILE).read_text().split() if n]
    out = args.dir / protocol.SCREEN_DIR
    out.mkdir(exist_ok=True)
    for old in [*out.glob("*.json"), *out.glob("*.port")]:  # (a job requeued in the same place)
        old.unlink()
    measuring = shlex.join(
        [
            sys.executable,
            "-m",
            protocol.MODULES["screen"],
            "measure",
            "--out",
            str(out),
            protocol.OPTIONS["device"],
            args.device,
            protocol.OPTIONS["devices"],
            str(args.devices),
            protocol.OPTIONS["host_addr"],
            args.host_addr,
            protocol.OPTIONS["link_seconds"],
            str(args.link_seconds or min(LINK_SECONDS, args.seconds / 4)),
        ]
    )
    ended = "did not end"
    try:  # (the launcher's words are shell words: $PBS_NODEFILE)
        launch = subprocess.run(
            ["bash", "-c", f"{args.per_node} {measuring}"],
            stdin=subprocess.DEVNULL,
            timeout=args.seconds,
            check=False,
        )
        ended = f"exited {launch.returncode}"
    except subprocess.TimeoutExpired:
        protocol.say(protocol.SCREEN, f" no figures from every node within {args.seconds:g} s")
    found, links = figures(out, nodes)
    if not found:  # the launch itself failed, not the nodes: nothing to compare
        protocol.say(
            protocol.SCREEN, f" no node gave figures (the per-node launch {ended}): not screened"
        )
        return 0
    judged = judge(nodes, found, args.of_median, args.peak_gflops, args.of_peak, links)
    for node in judged:
        protocol.say(protocol.SCREEN, line(node))
    left_out = [node.node for node in judged if node.left_out]
    usable = len(nodes) - len(left_out)
    cost = time.time() - start
    if not left_out:
        verdict, code = "passed", 0
    elif args.on_fail == "warn":
        verdict, code = "warned", 0
    elif usable >= args.active:
        verdict, code = "left out", 0
    else:
        verdict, code = "stopped", protocol.EXIT_SCREENED_OUT
    result = files.ScreenResult(tuple(judged), round(cost, 3), verdict)
    protocol.write_atomically(args.dir / protocol.SCREEN_FILE, result.to_json())
    if verdict == "stopped":
        detail = "; ".join(f"{node.node}: {node.why}" for node in judged if node.left_out)
        files.write_outcome(
            files.Outcome(
                code, files.WHY_SCREENED_OUT, f"screened out {detail}", None, None, time.time()
            ),
            args.dir,
        )
    said = {
        "passed": f"passed: {len(nodes)} node(s)",
        "warned": f"{','.join(left_out)} far below, kept (--screen warn)",
        "left out": f"left out {','.join(left_out)}; the launch goes on without",
        "stopped": f"stopping before the trainer: {usable} usable node(s) of the "
        f"{args.active} it needs ({','.join(left_out)} left out, no spare left)",
    }[verdict]
    protocol.say(protocol.SCREEN, f" {said}; it took {cost:.1f} s")
    return code


def build_parser() -> argparse.ArgumentParser:
    o = protocol.OPTIONS
    parser = argparse.ArgumentParser(prog="python -m mmm_orch.injob.screen")
    sub = parser.add_subparsers(dest="action")
    each = sub.add_parser("measure")  # on every node, from the per-node launch
    each.add_argument("--out", type=Path, required=True)
    for p in (parser, each):
        p.add_argument(o["device"], default="cpu", choices=("cpu", "cuda", "xpu"))
        p.add_argument(o["devices"], type=int, default=0)
        p.add_argument(o["host_addr"], default="{node}")  # the profile's rendezvous.host_addr
        p.add_argument(o["link_seconds"], type=float, default=0.0)  # 0: from --seconds
    parser.add_argument(o["dir"], type=Path)
    parser.add_argument(o["active"], type=int, default=1)
    parser.add_argument(o["seconds"], type=float, default=60.0)
    parser.add_argument(o["of_median"], type=float, default=0.5)
    parser.add_argument(o["peak_gflops"], type=float)
    parser.add_argument(o["of_peak"], type=float, default=0.3)
    parser.add_argument(o["on_fail"], choices=("stop", "warn"), default="stop")
    parser.add_argument(o["per_node"], default="")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "measure":
        measure(
            args.out, args.device, args.devices, args.host_addr, args.link_seconds or LINK_SECONDS
        )
        return 0
    try:
        return run(args)
    except Exception as exc:  # the screen must never be why a job dies unexplained
        protocol.say(protocol.SCREEN, f" failed ({type(exc).__name__}: {exc}); not screened")
        return 0


if __name__ == "__main__":
    sys.exit(main())
