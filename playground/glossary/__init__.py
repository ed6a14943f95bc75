"""The glossary: plain words for every toggle and figure, as tooltips and as a tab of their own."""
