"""Draw benchmark records: GB/s and round latency against items per rank (matplotlib)."""

__all__ = ["plot"]

_METHODS = (("rafi", "rafi"), ("raw_floor", "bare transport"), ("hand_written", "hand-written"))
_STYLES = {16: ":", 64: "-", 256: "--"}


def plot(records, path):
    """Write a PNG with one row per traffic pattern: GB/s (left) and ms per round (right)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    patterns = sorted({r["pattern"] for r in records})
    fig, axes = plt.subplots(len(patterns), 2, figsize=(11, 3.6 * len(patterns)), squeeze=False)
    first = records[0]
    for row, pattern in zip(axes, patterns):
        for itemsize in sorted({r["itemsize"] for r in records}):
            points = sorted(
                (r for r in records if r["pattern"] == pattern and r["itemsize"] == itemsize),
                key=lambda r: r["items_per_rank"],
            )
            x = [r["items_per_rank"] for r in points]
            for color, (key, label) in zip(("C0", "C2", "C3"), _METHODS):
                style = dict(color=color, linestyle=_STYLES.get(itemsize, "-"), marker="o", markersize=3)
                name = f"{label}, {itemsize} B"
                row[0].plot(x, [r[f"{key}_GBps"] for r in points], label=name, **style)
                row[1].plot(x, [r[f"{key}_s"] * 1e3 for r in points], label=name, **style)
        row[0].set(xscale="log", ylabel="GB/s (all ranks' payload)", title=f"{pattern}: throughput")
        row[1].set(xscale="log", yscale="log", ylabel="ms per round", title=f"{pattern}: round latency")
        for ax in row:
            ax.set_xlabel("items per rank")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][1].legend(fontsize=7, ncol=2)
    fig.suptitle(
        f"rafi forward(): {first['ranks']} ranks, {first['backend']} backend, "
        f"{first['transport']} transport (floor: {first['floor']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
