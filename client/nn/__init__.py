"""A small model toolkit over :mod:`client.autodiff`, in PyTorch's idiom: modules, layers,
losses, seeded initialisation and safetensors weights files.

::

    import client
    from client import nn, optim
    from client.autodiff import Autodiff

    ad = Autodiff(client.namespace(dev))          # or leave ad= out: numpy, locally
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16, ad=ad), nn.ReLU(), nn.Linear(16, 3, ad=ad))
    loss = nn.cross_entropy(model(x), labels)     # computed on the server
    loss.backward()
    model.save("model.safetensors")               # loads into a local model, or PyTorch's

Parameters are drawn on the client with numpy and uploaded once, so one seed gives one model
on every device. Random numbers at run time (dropout's masks, ``nn.rand``) are drawn on the
device by its own generator (``client.nn.random``), which ``nn.manual_seed`` seeds too.
Convolutions, pooling, batch normalization and device random numbers are Tensorwire's own
extension, outside the Array API standard. The package reaches nothing of ``client`` but
``client.autodiff``: it runs over whatever namespace that wraps.
"""

from __future__ import annotations

from .attention import MultiheadAttention as MultiheadAttention
from .convolution import Conv1d as Conv1d
from .convolution import Conv2d as Conv2d
from .convolution import ConvTranspose2d as ConvTranspose2d
from .data import DataLoader as DataLoader
from .functional import cross_entropy as cross_entropy
from .functional import embedding as embedding
from .functional import gelu as gelu
from .functional import layer_norm as layer_norm
from .functional import linear as linear
from .functional import mse_loss as mse_loss
from .functional import relu as relu
from .functional import tanh as tanh
from .init import default_generator as default_generator
from .init import local_autodiff as local_autodiff
from .layers import GELU as GELU
from .layers import Dropout as Dropout
from .layers import Embedding as Embedding
from .layers import Flatten as Flatten
from .layers import LayerNorm as LayerNorm
from .layers import Linear as Linear
from .layers import ReLU as ReLU
from .layers import Sequential as Sequential
from .layers import Tanh as Tanh
from .loading import StateDictError as StateDictError
from .module import Module as Module
from .normalization import BatchNorm1d as BatchNorm1d
from .normalization import BatchNorm2d as BatchNorm2d
from .pooling import AvgPool2d as AvgPool2d
from .pooling import MaxPool2d as MaxPool2d
from .random import initial_seed as initial_seed
from .random import manual_seed as manual_seed
from .random import rand as rand
from .random import randn as randn
from .weights import WeightsFileError as WeightsFileError
from .weights import load as load
from .weights import load_metadata as load_metadata
from .weights import save as save
