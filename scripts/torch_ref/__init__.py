"""The independent PyTorch reference behind scripts/torch_reference.py (its docstring defines every
model and bound; that script is the entry point): the parameter tables (shapes), the readers of a
picotrain checkpoint (checkpoint), of a reference_dump folder (dump) and of a Hugging Face folder
(hf), the float64 models (models) and the training pass on them (objective), the comparison
(compare) and the self-test of the Llama and Mixtral against a scalar loop (self_test). This file
holds the one thing they share: BadInput.
"""


class BadInput(Exception):
    """A checkpoint or dump that cannot be compared (exit status 2)."""
