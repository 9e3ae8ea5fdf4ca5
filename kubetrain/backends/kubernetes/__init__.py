"""The cluster backends (a Kubeflow Trainer TrainJob, or an Indexed Job + headless Service)
over the Kubernetes API, with what only they need: the API client, watches, pod diagnosis,
ownership, `doctor` and the permissions the steps use."""
