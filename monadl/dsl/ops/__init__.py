"""The library's ops, by family: one module per family, each op one declaration beside its public
function (see ``docs/design.md``, "Adding an op").

* ``operators``: the ops behind the layers' operators (``+ - * / ** @``, indexing);
* ``elementwise``: ``exp``, ``log``, ``sqrt``, ``abs``, ``maximum``, ``minimum``, ``add_n``, ``lift``;
* ``activations``: ``tanh``, ``sigmoid``, ``relu``, ``softplus``, ``gelu``, ``silu``, ``leaky_relu``,
  ``elu``, ``clip``, ``softmax``, ``log_softmax``;
* ``reductions``: ``sum``, ``mean``, ``max``, ``min``, ``logsumexp``, ``var``, ``std``, ``argmax``;
* ``shape``, ``flatten``, ``padding``: ``reshape``, ``transpose``, ``concatenate``, ``split``,
  ``stack``, ``flatten``, ``pad``;
* ``selection``: ``take_rows``, ``take_along_axis``, ``where``, ``index_arrays``;
* ``linalg``: ``matmul``, ``dot``, ``linear``;
* ``losses``, ``classification``: the regression and binary losses; ``cross_entropy``, ``nll_loss``;
* ``conv``, ``conv_transpose``, ``pooling``, ``adaptive_pool``: convolutions and pooling;
* ``norm``, ``batch_norm``: layer, group, RMS and batch normalisation;
* ``attention``: scaled dot-product attention;
* ``recurrent``, ``packing``, ``packed_lstm``, ``packed_gru``: the recurrent cells' ops and the
  whole-layer LSTM and GRU.

``registry`` declares library ops and lists them; ``shape_rules`` holds what shape rules share.
This package imports none of its modules (the layers import ``operators``, which must not wait on
the modules that import the layers).
"""
