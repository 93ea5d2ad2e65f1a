// Package layering checks that the import rule each quiver package states in
// its package comment ("Imports from quiver: ...") is the rule its code
// follows, so that the layering the README draws (transport -> domain ->
// storage) stays true as the code grows.
//
// Imports from quiver: nothing.
package layering
