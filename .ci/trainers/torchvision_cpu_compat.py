"""Lets a CUDA build of torchvision import beside a CPU build of torch (the ms-swift venv, .ci/trainers/swift.sh).

torchvision's PyPI wheels (0.28.0 pairs with torch 2.13.0) are CUDA builds: with the CPU torch their compiled ops
(``torchvision/_C.so`` links ``libtorch_cuda.so``) do not load, which torchvision tolerates everywhere except two
unguarded ``torch.library.register_fake("torchvision::nms" / "::qnms")`` calls in ``_meta_registrations``: its import
then fails, and with it transformers' Qwen-VL processors and ``qwen_vl_utils``. Installed as a ``.pth`` hook, this
declares those two operator schemas (no kernel: calling nms raises) just before torchvision is first imported, on a
CPU torch only. torchvision's pure-Python transforms, which the Qwen-VL image and video processors use, then work.
"""
import importlib.abc
import sys

_LIBS = []


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            if torch.version.cuda is None:  # a CPU torch: torchvision's CUDA-linked ops cannot load
                lib = torch.library.Library("torchvision", "DEF")
                for op in ("nms", "qnms"):
                    lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
                _LIBS.append(lib)
        return None


sys.meta_path.insert(0, _BeforeTorchvision())
