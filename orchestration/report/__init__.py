"""Figures for people: confidence intervals of accuracies (stats) and the run's and eval's plots (plots)."""
