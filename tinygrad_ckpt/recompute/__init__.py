"""Recomputation: the segment operator (`tg.checkpoint`), and the features layered on its one hook
(selective policies, the early stop, the replay check), blocks run under a plan, and the planner."""
