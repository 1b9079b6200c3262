# Install rules and the CMake package: find_package(flexjit CONFIG) -> flexjit::flexjit.
#
#   include/flexjit/*.h                    public headers
#   lib/libflexjit.a | libflexjit.so.0.1   the library (BUILD_SHARED_LIBS picks)
#   bin/flexjit                            the CLI (FLEXJIT_BUILD_CLI)
#   lib/cmake/flexjit/                     flexjitConfig.cmake, its version file, the targets
include(CMakePackageConfigHelpers)

set(FLEXJIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flexjit)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/flexjit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT flexjit_Development FILES_MATCHING PATTERN "*.h")
install(TARGETS flexjit EXPORT flexjitTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT flexjit_Runtime
                NAMELINK_COMPONENT flexjit_Development
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT flexjit_Development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT flexjit_Runtime)
if(FLEXJIT_BUILD_CLI)
  install(TARGETS flexjit-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT flexjit_Runtime)
endif()

install(EXPORT flexjitTargets NAMESPACE flexjit:: DESTINATION ${FLEXJIT_CMAKE_DIR}
        COMPONENT flexjit_Development)
# The same targets for a build tree: find_package(flexjit) with flexjit_DIR=<build dir>.
export(EXPORT flexjitTargets NAMESPACE flexjit:: FILE ${PROJECT_BINARY_DIR}/flexjitTargets.cmake)

# What flexjitConfig.cmake needs to know about this build.
set(FLEXJIT_SHARED ${BUILD_SHARED_LIBS})
get_filename_component(FLEXJIT_LLVM_LIBRARY_NAME ${FLEXJIT_LLVM_LIBRARY} NAME)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flexjitConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/flexjitConfig.cmake
                              INSTALL_DESTINATION ${FLEXJIT_CMAKE_DIR})
# 0.x: minor versions may break the API, so 0.1 accepts 0.1.*, not 0.2.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flexjitConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flexjitConfig.cmake ${PROJECT_BINARY_DIR}/flexjitConfigVersion.cmake
        DESTINATION ${FLEXJIT_CMAKE_DIR} COMPONENT flexjit_Development)
