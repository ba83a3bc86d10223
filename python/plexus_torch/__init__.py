"""Plexus collectives as a torch.distributed backend.

    import torch.distributed as dist
    import plexus_torch  # registers the backend "plexus"
    dist.init_process_group("plexus", rank=rank, world_size=world_size, init_method=...)

The backend connects the ranks over the store torch hands it (one per group, so new_group works):
over shm when every rank runs on one host, over tcp otherwise (PLEXUS_TORCH_TRANSPORT=tcp|shm
forces either). See docs/torch.md for the collectives, dtypes and errors.
"""

import torch.distributed as dist

from ._C import ProcessGroupPlexus, base, have_cuda, version  # noqa: F401

BACKEND = "plexus"


def _create(store, rank, world_size, timeout):
    return ProcessGroupPlexus(store, rank, world_size, timeout)


def _register():
    # Registering twice raises in torch; importing the module twice must not.
    if BACKEND.upper() in dist.Backend._plugins:
        return
    if base == "Backend":
        # PyTorch 2: the class is a c10d.Backend that torch wraps in a ProcessGroup, one per
        # device type it declares; CUDA tensors only where the build moves them.
        dist.Backend.register_backend(BACKEND, _create,
                                      devices=["cpu", "cuda"] if have_cuda else ["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, _create)


_register()
