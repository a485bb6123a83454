"""What things look like in every view, and which layer a name belongs to: shared by the matplotlib
figures (plots.py) and the HTML explorer (explorer.py), so a category, a phase or a lifetime stage
has one color everywhere. Imports nothing."""

CATEGORY_COLORS = {
    "parameter": "#4C72B0",
    "optimizer": "#8172B3",
    "gradient": "#DD8452",
    "activation": "#C44E52",
    "other": "#A5A5A5",
}
CATEGORY_LABELS = {
    "parameter": "parameters",
    "optimizer": "optimizer states",
    "gradient": "gradients",
    "activation": "activations (saved for backward)",
    "other": "other (inputs, outputs, temporaries)",
}
PHASE_COLORS = {"forward": "#DCEBF7", "backward": "#FBE3D3", "recompute": "#DDF2DD", "optimizer": "#E9E1F3"}
LIFETIME_COLORS = {
    "waiting": "#C9D6E3",  # saved, forward still running
    "idle": "#E07B39",  # backward running, but not yet reached this buffer
    "used": "#3A923A",  # read by backward, until freed
    "held": "#7F7F7F",  # never freed while the ledger watched (a tensor still refers to it)
}
LIFETIME_LABELS = {
    "waiting": "saved, forward still running",
    "idle": "idle: backward not here yet",
    "used": "read by backward, then freed",
    "held": "still referenced at the end",
}


def layer_of(name: str) -> str:
    """The layer a saved buffer belongs to: 'h.3.mlp.gelu:x' -> 'h.3', 'ln_f.layer_norm:xhat' -> 'ln_f',
    and an op outside any module names itself: 'cross_entropy:logits' -> 'cross_entropy'."""
    op_name = name.split(":")[0]
    parts = op_name.split(".")
    if len(parts) >= 2 and parts[0] == "h" and parts[1].isdigit():
        return f"h.{parts[1]}"
    return parts[0]
