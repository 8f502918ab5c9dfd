"""``plan --chart``: the per-GPU memory breakdown of each plan against its HBM (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path

GIB = 1024**3
PARTS = (
    "parameters",
    "gradients",
    "optimizer_states",
    "unsharded_in_flight",
    "activations",
    "logits_and_loss",
    "overhead",
)


def memory_chart(plans: list, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plan --chart needs matplotlib: pip install 'tiered-training[plot]'") from None
    plans = [p for p in plans if p.memory is not None]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(plans) + 3), 5))
    names = [p.name for p in plans]
    bottoms = [0.0] * len(plans)
    for part in PARTS:
        values = [getattr(p.memory, part) / GIB for p in plans]
        ax.bar(names, values, bottom=bottoms, label=part.replace("_", " "))
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for i, plan in enumerate(plans):
        hbm = plan.memory.hbm / GIB
        ax.hlines(hbm, i - 0.4, i + 0.4, colors="black", linewidth=2)
        ax.hlines(hbm * plan.tier.memory_headroom, i - 0.4, i + 0.4, colors="red", linestyles="dashed")
    ax.set_ylabel("GiB per GPU (black: HBM, red dashed: headroom)")
    ax.set_title("Planned memory per GPU")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
