"""The dataset prep step as a KFP v2 lightweight Python component.

KFP ships only the function's source to the pod, so the function imports what it needs
inside itself; the image (``COMPONENT_IMAGE``) already has kubetrain installed.
"""

from kfp import dsl

from kubetrain.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def dataset_prep(
    dataset: dsl.Output[dsl.Dataset],
    source: str = "sklearn:digits",
    test_fraction: float = 0.2,
    validation_fraction: float = 0.1,
    seed: int = 0,
    storage: str = "",
    run_name: str = "",
):
    """Prepare a split, normalised, checksummed dataset folder for the training step.

    Args:
        dataset: Output folder in the kubetrain dataset format (manifest.json,
            train.safetensors, validation.safetensors, test.safetensors).
        source: sklearn:digits (offline), torchvision:MNIST|FashionMNIST|CIFAR10, or a
            local .npz file or folder (path or file:// URL) visible to the pod.
        test_fraction: Share of samples held out for testing (stratified split); ignored
            by sources with their own split.
        validation_fraction: Share of the training samples set aside as the validation split
            the trainer scores each epoch on (stratified), 0 to 0.5; 0 writes none.
        seed: Seed of the split; the same seed gives byte-identical files.
        storage: Object-storage URL (e.g. s3://bucket/prefix); when given, the dataset is
            written to storage/datasets/<run_name> and ``dataset`` holds only a LOCATION
            pointer to it (its metadata ``uri`` names it too).
        run_name: Names the dataset's folder under ``storage``; pass the pipeline run's name.
    """
    from kubetrain import storage as object_storage
    from kubetrain.components.dataset_prep.prep import prepare_dataset
    from kubetrain.process_exit import skip_exit_collection

    output = object_storage.run_folder(storage, "datasets", run_name) if storage else dataset.path
    manifest = prepare_dataset(
        source=source,
        output_dir=output,
        test_fraction=test_fraction,
        seed=seed,
        validation_fraction=validation_fraction,
    )
    if storage:
        object_storage.write_pointer(dataset.path, output)
        dataset.metadata["uri"] = str(output)
    dataset.metadata.update(
        {
            "format": manifest["format"],
            "source": manifest["source"],
            "seed": manifest["seed"],
            "split": manifest["split"],
            "train_count": manifest["splits"]["train"]["count"],
            "validation_count": manifest["splits"].get("validation", {}).get("count", 0),
            "test_count": manifest["splits"]["test"]["count"],
            "num_classes": manifest["num_classes"],
            "classes": manifest["classes"],
            "sample_shape": manifest["sample_shape"],
            "train_sha256": manifest["splits"]["train"]["sha256"],
            "test_sha256": manifest["splits"]["test"]["sha256"],
        }
    )
    skip_exit_collection()  # the step's process ends here: skip the exit scan of numpy/sklearn
