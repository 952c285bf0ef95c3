"""After the search: export a configuration from a study, train it for real, load and predict,
convert to PEFT or a merged model, and the PEFT/AdapterHub mappings."""
