# The imported targets ulpgate::mpfr and ulpgate::gmp, for this build (CMakeLists.txt) and for
# find_package(ulpgate) (ulpgateConfig.cmake, with the build's directories as hints).
# MPFR and GMP ship no CMake config; plain find_* works on Debian and with the unpacked
# packages of shared/device (CMAKE_PREFIX_PATH), where pkg-config files point elsewhere.
# Sets ULPGATE_MPFR_GMP_MISSING to what was not found (the caller decides how to fail).
set(ULPGATE_MPFR_GMP_MISSING)
foreach(lib mpfr gmp)
  string(TOUPPER ${lib} LIB)
  if(TARGET ulpgate::${lib})
    continue()
  endif()
  find_path(${LIB}_INCLUDE_DIR ${lib}.h HINTS ${ULPGATE_${LIB}_HINTS})
  find_library(${LIB}_LIBRARY ${lib} HINTS ${ULPGATE_${LIB}_HINTS})
  if(NOT ${LIB}_INCLUDE_DIR OR NOT ${LIB}_LIBRARY)
    list(APPEND ULPGATE_MPFR_GMP_MISSING "${lib} (${lib}.h: ${${LIB}_INCLUDE_DIR}, lib${lib}: ${${LIB}_LIBRARY})")
    continue()
  endif()
  add_library(ulpgate::${lib} UNKNOWN IMPORTED)
  set_target_properties(ulpgate::${lib} PROPERTIES IMPORTED_LOCATION ${${LIB}_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${${LIB}_INCLUDE_DIR})
endforeach()
