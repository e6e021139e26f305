"""What autograd keeps for a backward, counted as the memory plan counts activations."""
import torch


def saved_bytes(model, forward) -> int:
    """Bytes autograd keeps for the backward of `forward()`, each storage once, the model's
    parameters left out (they are the weights, not activations)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(kept.values())
