"""An example model package for disttrain: `model.name: my_model.model:factory`."""
