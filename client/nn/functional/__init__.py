"""The layers' computations as functions (PyTorch's ``torch.nn.functional`` names, argument
orders and defaults), over tensors of any autodiff namespace.

Each function takes tensors or plain arrays and runs in the namespace of its first tensor, so
the same call computes on numpy or on a server, wherever the model's parameters are. A plain
array is taken as a constant of that namespace (a numpy array given to a remote model is
uploaded). Arguments and shapes are checked here, on the client, so a mistake is reported
with the names a user knows instead of as a broadcasting error from deep inside the server.

Convolutions, pooling, batch normalization, softmax and dropout's random numbers are
Tensorwire's own extension, outside the Array API standard (which has none of them): they run
on a Tensorwire namespace or numpy, and a namespace without the extension refuses them.
"""

from __future__ import annotations

from .arguments import ArrayLike as ArrayLike
from .arguments import as_tensor as as_tensor
from .arguments import namespace_of as namespace_of
from .attention import scaled_dot_product_attention as scaled_dot_product_attention
from .convolution import conv1d as conv1d
from .convolution import conv2d as conv2d
from .convolution import conv_transpose2d as conv_transpose2d
from .dense import embedding as embedding
from .dense import flatten as flatten
from .dense import gelu as gelu
from .dense import linear as linear
from .dense import log_softmax as log_softmax
from .dense import relu as relu
from .dense import softmax as softmax
from .dense import tanh as tanh
from .dropout import dropout as dropout
from .losses import Reduction as Reduction
from .losses import cross_entropy as cross_entropy
from .losses import mse_loss as mse_loss
from .normalization import batch_norm as batch_norm
from .normalization import layer_norm as layer_norm
from .pooling import avg_pool2d as avg_pool2d
from .pooling import max_pool2d as max_pool2d
