"""Deployment on the CPU: LeViT's int8 (sec. 5.3), compiled latency and the ONNX export.

Modules (none imports torch on ``import archspec.deploy``):

* :mod:`archspec.deploy.int8` -- ``quantize`` / ``load_quantized`` / ``save_quantized``: int8 post-training
  quantisation as LeViT did it, on torchao's PT2E flow, compiled by Inductor;
* :mod:`archspec.deploy.onnx_export` -- ``export_onnx``: ONNX with a dynamic batch, checked in ONNX Runtime;
* :mod:`archspec.deploy.build` -- what ``archspec build --torch-compile / --int8`` adds to a build;
* :mod:`archspec.cli.deploy` -- the ``archspec export`` command line and ``build``'s deployment options
  (torch-free parsers).

Compiled latency itself (``compile_for_inference``) lives with the other timing rules in
:mod:`archspec.diagnostics.timing`, which ``archspec search --latency-compile`` shares.  The public names are
``archspec.quantize``, ``archspec.load_quantized``, ``archspec.QuantizedModel`` and ``archspec.export_onnx``.
"""
