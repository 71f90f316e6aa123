"""Models: what a model is (spec), the zoo and user models, graph modes and compiled packages."""
