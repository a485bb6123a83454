"""What things look like in every view: shared by the matplotlib figures (plots.py) and the HTML explorer
(explorer.py), so a category, a phase or a lifetime stage has one color everywhere. Imports nothing."""

CATEGORY_COLORS = {
    "parameter": "#4C72B0",
    "optimizer": "#8172B3",
    "gradient": "#DD8452",
    "activation": "#C44E52",
    "other": "#A5A5A5",
    "untouched": "#DADADA",  # a light grey band, hatched and stacked on top: apart from what the run used
}
UNTOUCHED_HATCH = "#B4B4B4"  # the hatching over the untouched band
CATEGORY_LABELS = {
    "parameter": "parameters",
    "optimizer": "optimizer states",
    "gradient": "gradients",
    "activation": "activations (saved for backward)",
    "other": "other (inputs, outputs, temporaries)",
    "untouched": "untouched (held before the ledger, never used by it; not in the peak)",
}
PHASE_COLORS = {"forward": "#DCEBF7", "backward": "#FBE3D3", "recompute": "#DDF2DD", "optimizer": "#E9E1F3"}
RECOMPUTE_MARK = "#2E8B57"  # a timeline marks where replays run with this, along its top edge
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

