"""Real models at real size: the estimate's formulas, measured steady steps on the meta backend, parallel
shards, devices, and the printed report."""
