# json_set(<json var> <key> <plain string>): string(JSON SET) takes a JSON value, so quote and escape.
function(json_set var key value)
  string(REPLACE "\\" "\\\\" value "${value}")
  string(REPLACE "\"" "\\\"" value "${value}")
  string(REPLACE "\t" "\\t" value "${value}")
  string(STRIP "${value}" value)
  string(JSON out SET "${${var}}" "${key}" "\"${value}\"")
  set(${var} "${out}" PARENT_SCOPE)
endfunction()
