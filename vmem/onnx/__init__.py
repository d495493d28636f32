"""ONNX models in and out of vmem: bring a model from PyTorch, Keras or any zoo, plan and train it, and export
it back.

    import vmem
    net = vmem.onnx.load("resnet50.onnx")           # a vmem.Graph holding the model's weights
    print(vmem.plan(net, batch=64, device="sim:v100-16gb", memory="6GiB"))
    with vmem.Trainer(net, memory="512MiB") as trainer:  # starts from the imported weights
        ...
    vmem.onnx.save(net, "trained.onnx")                # onnxruntime runs it with the same outputs

:func:`load` turns every node into a vmem layer; the weights of convolutions, Gemm and MatMul, and batch
norm's scale and shift, become trainable parameters (batch norm's running statistics its buffers). What only
computes shapes (``Shape``, ``Gather``, ``Concat`` of constants feeding a ``Reshape``, as exporters write
``x.view(x.size(0), -1)``) is evaluated at import by ONNX's reference implementation, the batch axis kept
symbolic. Converters are keyed by the op's version (its ``since_version`` at the model's opset), so a model
at any opset from :data:`MIN_OPSET` on imports when each of its ops' versions is one a converter was written
for; anything else (an op, an op version, an attribute value) is refused before anything is built, every
such node named with its op, version and the model's opset, and the supported list given.

:func:`save` writes a vmem network as an ONNX model (opset 13 to 21) that onnxruntime runs: the weights as
trained, batch norm kept as an inference-mode node or folded into the convolution before it.

Both need the ``onnx`` package (``pip install 'vmem[onnx]'``), imported only when they are called.
"""

from __future__ import annotations

from ._load import MIN_OPSET, load, supported
from ._save import save

__all__ = ["load", "save", "supported", "MIN_OPSET"]
