"""Server side: the ServerApp, the honest-but-curious FedAvg strategies, ready-made run configs and the launcher."""
