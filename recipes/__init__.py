"""The recipes of mmpos: what runs, beside the library (torchtune's split).

``configs/`` holds the YAML recipes (``mmpos list recipes``), ``tasks/`` the task modules that build,
train and evaluate them through :mod:`mmpos.runner`, ``data/`` the data generators only recipes use,
and :mod:`recipes.vlm` the tiny vision-language model of the multimodal recipes. The package registers
itself with the runner through the ``mmpos.recipes`` entry point (``pyproject.toml``); nothing in
:mod:`mmpos` imports it. This file imports nothing, so finding a recipe stays fast.
"""
