"""Flower ClientApp: each simulated node trains the victim model on its own private partition."""
