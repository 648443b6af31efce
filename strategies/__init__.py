"""Server side: the honest-but-curious FedAvg strategy, the attacker actors and the evaluator."""
