"""quickstart: a Flower / PyTorch app (the ServerApp), its strategy chosen by the run config."""

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedProx

from quickstart.task import Net, training_images

# Create ServerApp
app = ServerApp()


def make_strategy(run_config) -> FedAvg:
    """The run config's ``strategy``: fedavg, fedprox, fedadam or fedavgm (Flower's own)."""
    common = {"fraction_train": run_config["fraction-train"], "fraction_evaluate": run_config["fraction-evaluate"]}
    name = run_config["strategy"]
    if name == "fedavg":
        return FedAvg(**common)
    if name == "fedprox":
        return FedProx(**common, proximal_mu=run_config["proximal-mu"])
    if name == "fedadam":
        return FedAdam(**common, eta=run_config["fedadam-eta"])
    if name == "fedavgm":
        return FedAvgM(**common, server_momentum=run_config["fedavgm-momentum"])
    raise ValueError(f"strategy must be one of fedavg, fedprox, fedadam, fedavgm; got {name!r}")


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    num_rounds = context.run_config["num-server-rounds"]
    lr = context.run_config["learning-rate"]

    # Load global model
    global_model = Net(batch_norm=context.run_config["batch-norm"])
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize the strategy
    strategy = make_strategy(context.run_config)

    # --- fl-attack audit: the honest-but-curious server wraps the strategy (strategies/audit.py) ---
    from strategies.audit import audit  # isort: skip

    nodes, rc, norm = len(list(grid.get_node_ids())), context.run_config, ((0.5,) * 3, (0.5,) * 3)
    truth = lambda p: training_images(p, nodes, rc["examples-per-partition"], rc["data-file"])  # noqa: E731
    model = lambda: Net(batch_norm=rc["batch-norm"])  # noqa: E731
    strategy = audit(strategy, context, model=model, dataset="cifar100", normalize=norm, truth=truth)
    # --- end of the audit block ---

    # Start strategy, run for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
    )

    print("\nFinal train metrics:", dict(result.train_metrics_clientapp.get(num_rounds, {})))
    print("Final evaluate metrics:", dict(result.evaluate_metrics_clientapp.get(num_rounds, {})))
