"""The C++ engine, directly: run ONNX models (Session) and inspect them (Model).

    sess = graphtrain.engine.Session("model.onnx")
    outputs = sess.run({"x": x})          # numpy arrays in, numpy out; torch tensors in, torch out

Arrays cross by DLPack without a copy when they are contiguous.
"""

from __future__ import annotations

from ._C import Model, Session, Stash, TrainingSession, supported_ops

__all__ = ["Model", "Session", "Stash", "TrainingSession", "supported_ops"]
