"""The extension points: a user's op (``custom``: ``custom_op``), a batchable operation
(``operation``: ``@batchable``) and direct style (``direct``). Nothing else in ``monadl.dsl``
imports them."""
