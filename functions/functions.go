// Package functions embeds the working copy of the ratelimit library: the Lua source that
// rlfn loads with FUNCTION LOAD, and that becomes a release when copied into versions/.
package functions

import _ "embed"

// Source is the working copy of functions/ratelimit.lua.
//
//go:embed ratelimit.lua
var Source string

// Library is the name the source registers with FUNCTION LOAD (its #!lua name= line).
const Library = "ratelimit"
