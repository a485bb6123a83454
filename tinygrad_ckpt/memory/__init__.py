"""Memory: the ledger (a recorder of every buffer, by category, from allocation to release) and its
collaborators (events, the untouched rule, the iteration window, capacity, the simulated CUDA caching
allocator); what it exports (Chrome trace, CSV, memory_viz, the explorer page); plots."""
