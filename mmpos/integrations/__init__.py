"""Adapters for backbone libraries; import the one you need, e.g.
``from mmpos.integrations import timm as mmpos_timm``.

* :mod:`mmpos.integrations.timm`: ``create_vit`` / ``convert`` for timm's ``VisionTransformer``;
* :mod:`mmpos.integrations.open_clip`: ``create_model`` / ``convert`` for open_clip's visual tower;
* :mod:`mmpos.integrations.checkpoint`: loading a checkpoint trained with other encoders.

Nothing is imported here, so importing :mod:`mmpos.integrations` pulls in no backbone library.
"""
