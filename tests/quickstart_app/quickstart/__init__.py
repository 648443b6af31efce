"""quickstart: a Flower / PyTorch app laid out as Flower's quickstart-pytorch (not fl-attack's)."""
