"""``python -m rafi [--json]``: a report of what rafi finds here, to paste into a bug report.

Under ``mpirun -n N python -m rafi`` every rank probes and rank 0 prints, ranks grouped per node.
"""

import argparse
import json
import sys

from ._report import ENVIRONMENT, collect, failed

WIDTH = 14  # the label column


def _text(value):
    if failed(value):
        return f"error: {value['error']}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _section(title, rows):
    return ["", title] + [f"  {label:<{WIDTH}} {_text(value)}" for label, value in rows]


def _mpi(mpi):
    if failed(mpi):
        return _section("MPI", [("mpi4py", mpi)])
    aware = mpi["cuda-aware"]
    if not failed(aware):
        aware = f"{_text(aware['answer'])} ({aware['how']})"
    return _section("MPI", [*((k, v) for k, v in mpi.items() if k != "cuda-aware"), ("CUDA-aware", aware)])


def _transport(link):
    if failed(link):
        return link
    peers = [f"{who} over {link[who]}" for who in ("node peers", "other nodes") if link[who]]
    return f"{link['name']}: {', '.join(peers) or 'no peers'} ({link['why']})"


def _choice(report):
    backend = report["choice"]["backend"]
    rows = [("backend", backend if failed(backend) else f"{backend['name']}: {backend['why']}")]
    nodes = report["nodes"]
    for node in nodes:
        link = _text(_transport(node["transport"]))
        rows.append(("transport", f"node {node['host']}: {link}" if len(nodes) > 1 else link))
    rows.append(("resident mode", _resident(backend, nodes)))
    return _section('Choice (backend="auto", transport="auto", mode="bsp")', rows)


def _resident(backend, nodes):
    """Whether rounds can run on the device here (``mode="resident"``), and at what cost."""
    across = f"; across the {len(nodes)} nodes through each rank's host (MPI)" if len(nodes) > 1 else ""
    if failed(backend) or backend["name"] != "cuda":
        return f"yes, through a file in the node's shared memory, /dev/shm (shm){across}"
    return _resident_gpus(nodes[0]) + across


def _resident_gpus(node):
    """How one node's ranks run resident rounds on their GPUs."""
    ranks = node["ranks"]
    buses = [r["gpu"].get("pci bus") for r in ranks if isinstance(r["gpu"], dict) and not failed(r["gpu"])]
    shared = max((buses.count(b) for b in buses), default=1)
    cuda = node["cuda"]
    mps = "" if failed(cuda) else str(cuda.get("MPS", ""))
    if shared > 1 and not mps.startswith("on"):
        return (
            f"yes over ipc, but {shared} ranks share a GPU without MPS: their persistent kernels take "
            "turns and a round costs milliseconds; start MPS (nvidia-cuda-mps-control -d)"
        )
    return f"yes, over ipc ({shared} rank{'s' * (shared > 1)} per GPU{', MPS on' if shared > 1 else ''})"


def _environment(env):
    if env:
        return ["", "Environment"] + [f"  {name}={value}" for name, value in env.items()]
    names = ", ".join(key + "*" if key.endswith("_") else key for key in ENVIRONMENT)
    return ["", "Environment", f"  (none set of {names})"]


def _gpus(gpus):
    if not isinstance(gpus, list):
        return [("GPUs", gpus)]
    return [(f"GPU {i}", gpu if failed(gpu) else _describe(gpu)) for i, gpu in enumerate(gpus)]


def _describe(gpu):
    what = f"compute capability {gpu['compute capability']}, {gpu['memory GiB']} GiB"
    return f"{gpu['name']}, {what}, PCI {gpu['pci bus']}"


def _rank(record, node):
    backend, gpu = record["backend"], record["gpu"]
    parts = [f"local {record['local rank']}/{record['local size']}"]
    parts.append(_text(backend) if failed(backend) else f"backend {backend['name']}")
    if isinstance(gpu, dict) and not failed(gpu):
        gpu = f"GPU {gpu['device']} ({gpu['name']}, {gpu['pci bus']})"
    parts.append(_text(gpu or "no GPU"))
    differs = record["environment differs"]
    parts += [f"{k}={v}" if v is not None else f"{k} unset" for k, v in differs.items()]
    if record["transport"] != node["transport"]:
        parts.append(f"transport {_text(_transport(record['transport']))}")
    return f"rank {record['rank']}", ", ".join(parts)


def _node(node):
    cuda = node["cuda"]
    rows = (
        [("CUDA", cuda)]
        if failed(cuda)
        else _gpus(cuda["gpus"]) + [i for i in cuda.items() if i[0] != "gpus"]
    )
    rows += [_rank(record, node) for record in node["ranks"]]
    count = len(node["ranks"])
    return _section(f"Node {node['host']}: {count} rank{'s' if count > 1 else ''}", rows)


def render(report):
    """The report of ``collect`` as text for people."""
    lines = [f"rafi {_text(report['versions']['rafi'])} system report (python -m rafi)"]
    lines += _section("Versions", report["versions"].items())
    lines += _mpi(report["mpi"]) + _choice(report) + _environment(report["environment"])
    for node in report["nodes"]:
        lines += _node(node)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m rafi", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    opts = parser.parse_args(argv)
    report = collect()
    if report is None:  # not rank 0
        return 0
    dump = json.dumps(report, indent=2, default=str)
    try:
        text = dump if opts.json else render(report)
    except Exception as exc:  # a report in an unforeseen shape: show it as it is
        text = f"{dump}\n(rendering failed: {type(exc).__name__}: {exc})"
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
