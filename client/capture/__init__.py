"""Capture: record an op stream as a graph, replay it anywhere, run it by id, export it.

::

    with client.capture.Capture(dev) as cap:        # any device; or dev.capture() on capture:
        x = cap.input("x", x)
        cap.output("y", xp.tanh(x @ w))             # w: declare it too, or it is refused
    graph = cap.graph
    graph.save("step.twgraph"); graph = Graph.load("step.twgraph")
    graph.replay(other_device, {"x": x2})          # ops sent as ops, on any device
    step = graph.register(dev); step.run({"x": x3}) # registered once, one op per run
    graph.to_onnx("step.onnx", dynamic_batch=True) # with the onnx extra; any batch size

``jit`` records a training step on its second call and replays it by id afterwards.
"""

from __future__ import annotations

from .device import CaptureDevice as CaptureDevice
from .graph import Graph as Graph
from .graph import GraphSummary as GraphSummary
from .graph import RegisteredGraph as RegisteredGraph
from .jit import Jitted as Jitted
from .jit import jit as jit
from .recorder import Capture as Capture
