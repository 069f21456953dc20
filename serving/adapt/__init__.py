"""Site adaptation: operator relabels become a site adapter (predictors.adapter) that is
fitted, held to a promotion gate, versioned, audited, shadowed and hot-swapped into the
live predictor. `examples` keeps the relabel log; `registry` does the rest."""
