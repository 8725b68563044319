"""From raw results to what people read: collect, references and verdicts, attribution, charts, report."""
