"""The trivial distributed program of B1b: join a gloo group, all-reduce one tensor, exit."""

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    assert int(value.item()) == dist.get_world_size()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
