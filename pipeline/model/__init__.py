"""Model: loading (funasr, hub, local directory), features, the batched engine, demo model directories."""
