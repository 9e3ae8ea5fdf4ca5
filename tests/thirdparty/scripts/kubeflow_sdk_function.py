"""A Kubeflow Trainer SDK training function, written in the style of the Fashion-MNIST example
(kubeflow/trainer ``examples/pytorch/image-classification/mnist.ipynb``,
``train_fashion_mnist()``): self-contained, every import and the CNN inside the function,
because the SDK ships the function's source alone. kubeflow/sdk's
``kubeflow/trainer/backends/kubernetes/utils.py`` (``get_command_using_train_func``) turns it
into the TrainJob's command: ``bash -c`` with a here-document that writes the dedented source
plus ``train_fashion_mnist(**func_args)`` to ``kubeflow_sdk_function.py`` in the working
folder and runs ``torchrun kubeflow_sdk_function.py`` (so the source must hold no ``$``,
backquote or backslash: the unquoted here-document would expand them).

Digits from ``$KUBETRAIN_DATA_DIR`` stand in for Fashion-MNIST; gloo on CPU. Rank 0 saves
``torch.save(model.state_dict(), "fashion_mnist_cnn.pt")`` of the DDP-wrapped model (its keys
prefixed ``module.``), then scores the final model on the test split and writes
``script_accuracy.json``.
"""


def train_fashion_mnist(epochs=6, lr=0.003, batch_size=32):
    import json
    import os

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, 1, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, 1, padding=1)
            self.fc1 = nn.Linear(2 * 2 * 32, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
            x = F.relu(self.fc1(x.flatten(1)))
            return self.fc2(x)

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    print(f"Distributed Training with WORLD_SIZE: {dist.get_world_size()}, RANK: {rank}")

    data_dir = os.environ["KUBETRAIN_DATA_DIR"]
    train = load_file(os.path.join(data_dir, "train.safetensors"))
    dataset = TensorDataset(train["x"], train["y"])
    sampler = DistributedSampler(dataset)
    train_loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for epoch in range(epochs):
        model.train()
        sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"Train Epoch: {epoch} Loss: {loss.item():.6f}", flush=True)

    if rank == 0:
        torch.save(model.state_dict(), "fashion_mnist_cnn.pt")
        test = load_file(os.path.join(data_dir, "test.safetensors"))
        model.eval()
        with torch.no_grad():
            predicted = model.module(test["x"]).argmax(dim=1)
        accuracy = (predicted == test["y"]).double().mean().item()
        with open("script_accuracy.json", "w") as file:
            json.dump({"accuracy": accuracy}, file)
        print(f"test accuracy {accuracy:.4f}", flush=True)
    dist.destroy_process_group()
