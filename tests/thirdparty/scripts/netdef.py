"""The corpus scripts' models, as ``build(sample_shape, num_classes)`` factories: what
``kubetrain run --model netdef:<fn>`` and ``kubetrain evaluate --model-factory netdef:<fn>``
rebuild each script's model with. A script imports its factory from here, except the Kubeflow
SDK's training function, which must be self-contained and defines its own copy of
:class:`FashionNet` (the names and shapes must match for its weights to load here)."""

from torch import nn


def _features(sample_shape):
    features = 1
    for size in sample_shape:
        features *= size
    return features


def build(sample_shape, num_classes):
    """A two-layer perceptron (the DDP snapshot, Lightning and HF-sharded scripts)."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(_features(sample_shape), 64), nn.ReLU(), nn.Linear(64, num_classes)
    )


class LayeredNet(nn.Module):
    """An input projection, a list of residual blocks and an output head: the shape of the
    FSDP2 example's Transformer (``model.layers`` sharded one by one, then the root)."""

    def __init__(self, features, num_classes, width=64, depth=2):
        super().__init__()
        self.flatten = nn.Flatten()
        self.input = nn.Linear(features, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.output = nn.Linear(width, num_classes)

    def forward(self, x):
        h = self.input(self.flatten(x)).relu()
        for layer in self.layers:
            h = h + layer(h).relu()
        return self.output(h)


def build_layered(sample_shape, num_classes):
    return LayeredNet(_features(sample_shape), num_classes)


class ToyModel(nn.Module):
    """The DCP recipe's ToyModel (``net1``, ``relu``, ``net2``) sized for the dataset."""

    def __init__(self, features, num_classes):
        super().__init__()
        self.flatten = nn.Flatten()
        self.net1 = nn.Linear(features, 64)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.net2(self.relu(self.net1(self.flatten(x))))


def build_toy(sample_shape, num_classes):
    return ToyModel(_features(sample_shape), num_classes)


class FashionNet(nn.Module):
    """The CNN ``train_fashion_mnist`` defines inside itself (kubeflow_sdk_function.py), for
    1x8x8 samples: conv1, conv2, fc1, fc2."""

    def __init__(self, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1, padding=1)
        self.fc1 = nn.Linear(2 * 2 * 32, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(self.conv1(x).relu(), 2, 2)
        x = nn.functional.max_pool2d(self.conv2(x).relu(), 2, 2)
        x = self.fc1(x.flatten(1)).relu()
        return self.fc2(x)


def build_fashion(sample_shape, num_classes):
    return FashionNet(num_classes)
