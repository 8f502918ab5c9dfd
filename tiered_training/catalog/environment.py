"""EFA and NCCL settings for each instance family: one source for the pipeline
definition (the training job's Environment) and the container's launcher."""

from __future__ import annotations

from tiered_training.catalog import instances

# Families whose instances have EFA. p4d/p4de and later have GPUDirect RDMA; the
# instance catalogue's ``rdma`` flag decides FI_EFA_USE_DEVICE_RDMA.
EFA_FAMILIES = frozenset({"p4", "p5", "p6"})
NCCL_FAMILIES = frozenset({"p5", "p6"})
NCCL_SETTINGS = {
    # awsome-distributed-training's P5 settings; sensible on P6 (same EFA generation or newer).
    "NCCL_BUFFSIZE": "8388608",
    "NCCL_P2P_NET_CHUNKSIZE": "524288",
    "NCCL_DEBUG": "WARN",
}
# Per-host: the launcher works it out on the instance, so the definition leaves it out.
HOST_SPECIFIC = frozenset({"NCCL_SOCKET_IFNAME"})


def family_environment(instance_type: str | None, network_interface: str | None = None) -> dict[str, str]:
    """EFA and NCCL settings for an instance type's family (empty for families without EFA)."""
    entry = instances().get(instance_type) if instance_type else None
    if entry is None:
        return {}
    env: dict[str, str] = {}
    if entry.family in EFA_FAMILIES and entry.efa_gbps > 0:
        env["FI_PROVIDER"] = "efa"
        env["FI_EFA_FORK_SAFE"] = "1"
        if entry.rdma:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    if entry.family in NCCL_FAMILIES:
        env.update(NCCL_SETTINGS)
        env["NCCL_SOCKET_IFNAME"] = network_interface or "^lo,docker"
    return env
