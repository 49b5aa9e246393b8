"""What notebooks show: ipywidgets (imported when built), token views as HTML, and matplotlib plots."""
