"""The classification-shaped toy task: is a text's first token id even? (tests/test_toy_task.py)"""
