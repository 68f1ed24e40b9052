package reqinfo

// BuiltinResources is builtinResources, for the external test against a real apiserver.
var BuiltinResources = builtinResources
